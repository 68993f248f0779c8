// Command workload is the real-node test image: a sandbox-like memory user and a pause.
//
//	workload pause
//	workload sandbox -cold-mib 150 -hot-mib 32 [-tick 100ms] [-report 10s] [-listen :8080]
//	workload spin -threads 4
//
// "sandbox" behaves like the pods swapwise exists for: it allocates a cold set once (an
// interpreter, a browser, a checkout that is loaded and then mostly idle), then keeps
// touching a hot set. Every -report it prints one JSON line on stdout with what it holds and
// how fast its hot loop runs, so the test reads it with `kubectl logs`. One hot "op" is one
// write to one 4 KiB page; hot_ops_per_s is measured while the loop works (time asleep between
// ticks is not counted), so it falls when the pod waits for the CPU or for pages from swap.
//
// With -listen, "sandbox" also answers GET /wake: it writes every page of both sets (what an
// idle agent sandbox does when its next prompt comes: its cold pages come back from swap)
// and answers with how many pages that was and how long it took. "spin" keeps -threads
// CPUs busy: CPU contention on the node, with no memory to speak of.
//
// Static, no libc: the same binary is the pause image and the workload image.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"
)

const (
	mib  = 1 << 20
	page = 4096
)

// held keeps both sets reachable for the life of the process. Without it the compiler sees
// that only len(cold) is used after allocation, the GC frees the cold set and the runtime
// returns it to the kernel: the pod would hold only its hot set.
var held struct{ cold, hot [][]byte }

type report struct {
	Phase        string  `json:"phase"`
	ColdMiB      int     `json:"cold_mib"`
	HotMiB       int     `json:"hot_mib"`
	AllocatedMiB int     `json:"allocated_mib"`
	HotOpsPerS   float64 `json:"hot_ops_per_s"`
	Passes       int64   `json:"passes"`
	Uptime       float64 `json:"uptime_s"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: workload pause | workload sandbox -cold-mib N -hot-mib M")
		os.Exit(2)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	switch os.Args[1] {
	case "pause":
		<-stop
	case "sandbox":
		sandbox(os.Args[2:], stop)
	case "spin":
		spin(os.Args[2:], stop)
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

// fill is the share of each page allocate writes pseudo-random bytes into (-fill): real
// memory compresses 2-4x under zram, a page of zeros to nothing.
var fill float64

// touch writes one byte per page of every block, so each page is really backed by memory.
func touch(blocks [][]byte, value byte) int {
	n := 0
	for _, b := range blocks {
		for i := 0; i < len(b); i += page {
			b[i] = value
			n++
		}
	}
	return n
}

func allocate(mibs int) [][]byte {
	blocks := make([][]byte, mibs)
	x := uint64(88172645463325252)
	random := int(fill * page)
	for i := range blocks {
		blocks[i] = make([]byte, mib)
		for p := 0; random > 0 && p < mib; p += page {
			for j := 0; j < random; j += 8 {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				for k := 0; k < 8 && j+k < random; k++ {
					blocks[i][p+j+k] = byte(x >> (8 * k))
				}
			}
		}
	}
	touch(blocks, 1)
	return blocks
}

func sandbox(args []string, stop <-chan os.Signal) {
	fs := flag.NewFlagSet("sandbox", flag.ExitOnError)
	coldMiB := fs.Int("cold-mib", 128, "MiB allocated once and then left alone")
	hotMiB := fs.Int("hot-mib", 32, "MiB written on every tick")
	tick := fs.Duration("tick", 100*time.Millisecond, "time between passes over the hot set")
	every := fs.Duration("report", 10*time.Second, "time between progress lines")
	listen := fs.String("listen", "", "address to answer GET /wake on (empty: none)")
	fs.Float64Var(&fill, "fill", 0, "share of each page filled with pseudo-random bytes (0-1)")
	_ = fs.Parse(args)

	start := time.Now()
	out := json.NewEncoder(os.Stdout)
	emit := func(r report) {
		r.ColdMiB, r.HotMiB, r.Uptime = *coldMiB, *hotMiB, time.Since(start).Seconds()
		_ = out.Encode(r)
	}
	held.cold = allocate(*coldMiB)
	held.hot = allocate(*hotMiB)
	allocated := len(held.cold) + len(held.hot)
	emit(report{Phase: "allocated", AllocatedMiB: allocated})
	var mu sync.Mutex // a wake-up and the hot loop do not write the same pages at once
	if *listen != "" {
		http.HandleFunc("/wake", func(w http.ResponseWriter, _ *http.Request) {
			mu.Lock()
			t0 := time.Now()
			pages := touch(held.cold, 2) + touch(held.hot, 2)
			took := time.Since(t0)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"pages": pages, "took_ms": float64(took.Microseconds()) / 1000})
		})
		go func() { _ = http.ListenAndServe(*listen, nil) }()
	}

	ticker := time.NewTicker(*tick)
	defer ticker.Stop()
	var ops, passes int64
	var busy time.Duration
	lastReport := time.Now()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		mu.Lock()
		t0 := time.Now()
		ops += int64(touch(held.hot, byte(passes)))
		busy += time.Since(t0)
		mu.Unlock()
		passes++
		if time.Since(lastReport) >= *every {
			rate := 0.0
			if busy > 0 {
				rate = float64(ops) / busy.Seconds()
			}
			emit(report{Phase: "running", AllocatedMiB: allocated, HotOpsPerS: rate, Passes: passes})
			ops, busy, lastReport = 0, 0, time.Now()
		}
	}
}

// spin keeps -threads goroutines busy on their own OS threads until stopped.
func spin(args []string, stop <-chan os.Signal) {
	fs := flag.NewFlagSet("spin", flag.ExitOnError)
	threads := fs.Int("threads", 2, "busy loops")
	_ = fs.Parse(args)
	runtime.GOMAXPROCS(*threads)
	for i := 0; i < *threads; i++ {
		go func() {
			x := uint64(1)
			for {
				x = x*6364136223846793005 + 1442695040888963407
				if x == 0 {
					fmt.Println(x)
				}
			}
		}()
	}
	fmt.Printf("{\"phase\": \"spinning\", \"threads\": %d}\n", *threads)
	<-stop
}
