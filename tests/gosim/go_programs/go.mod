// Classic Go channel programs that tests/gosim/test_go_conformance.py runs with a real Go
// toolchain and compares, line for line, with their gosim ports. Standard library only.
module gosimconformance

go 1.19
