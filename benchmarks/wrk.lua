-- wrk script for swapwise: POST one AdmissionReview (the file named by WRK_BODY) per
-- request with kube-apiserver's headers (benchmarks/payloads.py; the URL carries its
-- ?timeout= query), and print a JSON summary line (errors.status counts HTTP >= 400).
local body_file = os.getenv("WRK_BODY")
local f = assert(io.open(body_file, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["User-Agent"] = "kube-apiserver-admission"
wrk.headers["Accept"] = "application/json, */*"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept-Encoding"] = "gzip"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, ' ..
    '"status": %d, "timeout": %d, "p50": %d, "p90": %d, "p99": %d, "p999": %d, "max": %d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9), latency.max))
end
