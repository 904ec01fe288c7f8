module gpu-admission/bench/loadgen

go 1.22
