module gosim.bench/net

go 1.19
