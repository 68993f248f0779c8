// Quantity oracle: reads JSON strings, one per line; prints [input, ok, exact decimal value].
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/api/resource"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		var s string
		if err := json.Unmarshal(in.Bytes(), &s); err != nil {
			panic(err)
		}
		q, err := resource.ParseQuantity(s)
		var row []any
		if err != nil {
			row = []any{s, false, ""}
		} else {
			row = []any{s, true, q.AsDec().String()}
		}
		b, _ := json.Marshal(row)
		fmt.Fprintln(out, string(b))
	}
}
