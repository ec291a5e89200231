module gosim.example/benchmarks/core

go 1.19
