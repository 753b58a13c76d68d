#!/usr/bin/env bash
# Session 19's third device call (one H200, warm from s19_call2.sh: its Triton cache kept), as run: the tests that
# call 2's 555 s left unfinished or unstarted, 6 workers (the specialization file's cases, a document's bits wherever it
# sits at C = 256, the dweight tree's documented order).
CAKECONV_TEST_GPUS=1 timeout 400 python3 -m pytest -v -rf -m gpu -p no:cacheprovider -n 6 --dist load tests/test_gpu_specialization.py "tests/test_gpu.py::test_gpu_document_bits_do_not_depend_on_where_it_sits[256]" tests/test_gpu.py::test_gpu_dweight_tree_is_the_documented_order_every_time -k "not every_integer_argument" > $OUT/pytest_gpu_rest.log 2>&1; echo rc $?; grep -cE "PASSED" $OUT/pytest_gpu_rest.log; grep -E "FAILED|ERROR|passed|failed" $OUT/pytest_gpu_rest.log | tail -8
