module gosimbench/mem

go 1.19
