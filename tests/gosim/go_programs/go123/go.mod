// Timer programs that need Go 1.23's timer-channel semantics (synchronous timer channels,
// no stale value after Stop or Reset). A separate module so that its go line (which turns
// those semantics on) never reaches the Go 1.19 programs in the parent directory.
module gosimconformance123

go 1.23
