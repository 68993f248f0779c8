module swapwise.local/node/workload

go 1.22
