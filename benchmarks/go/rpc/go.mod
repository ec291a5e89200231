module gosim.bench/rpc

go 1.19
