module github.com/amber-run/amber

go 1.26.8
