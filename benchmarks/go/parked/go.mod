module gosim.bench/parked

go 1.19
