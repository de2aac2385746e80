#!/bin/bash
# The browser test under load (issue 34): test_browser_from_several_threads 50 times in a row (fresh browser
# each, repeat_several_threads.py) while two full suites run in parallel, everything pinned to one core
# (CORE, default 1: a harsher load than two suites on two cores). Writes OUT (default /tmp/browser_load):
# browser.log (the 50 runs, -v) and the suites' logs. Run from the repository root.
CORE=${CORE:-1}
OUT=${OUT:-/tmp/browser_load}
rm -rf "$OUT"; mkdir -p "$OUT"
for s in a b; do
  ( i=0; while [ ! -f "$OUT/done" ]; do i=$((i+1)); taskset -c "$CORE" .venv/bin/python -m pytest -q -p no:cacheprovider \
      --deselect tests/test_browser.py::test_browser_from_several_threads > "$OUT/suite_$s.$i.log" 2>&1; done ) &
  loops="$loops $!"
done
sleep 45  # the suites are past their imports and into the tests
PYTHONPATH=tests taskset -c "$CORE" .venv/bin/python -m pytest -v -p no:cacheprovider -c /dev/null \
  --rootdir benchmarks/browser_load benchmarks/browser_load/repeat_several_threads.py > "$OUT/browser.log" 2>&1
echo "browser runs rc=$?"; tail -1 "$OUT/browser.log"
touch "$OUT/done"
for loop in $loops; do for child in $(pgrep -P "$loop"); do kill -KILL "$child"; done; done  # the suites' pytest
