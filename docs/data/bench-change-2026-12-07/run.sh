#!/bin/sh
# before/after of BenchmarkEndpointChange, -count 5, interleaved so both see the same load
cd /tmp
for i in 1 2 3 4 5; do
  for v in before after; do
    echo "# $v run $i $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/benchraw/$v.txt
    nice -n 19 ./nft-$v.test -test.run XXX -test.bench 'BenchmarkEndpointChange' -test.benchtime 300x -test.count 1 2>&1 | grep -E '^Benchmark' >> /tmp/benchraw/$v.txt
  done
done
echo done >> /tmp/benchraw/status
