set -u
files="tests/test_gpu_hopper_bwd.py tests/test_gpu_hopper_block_sparse.py tests/test_sinks.py"
python3 -m pytest -m gpu --collect-only -q -p no:cacheprovider $files 2>/dev/null | grep "::" | sort > $OUT/all.txt
sort passed_s50b.txt > $OUT/passed.txt
comm -23 $OUT/all.txt $OUT/passed.txt > $OUT/rest.txt
wc -l $OUT/all.txt $OUT/rest.txt
timeout -s INT 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 $(cat $OUT/rest.txt) 2>&1 | tail -15
