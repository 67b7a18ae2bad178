# SPDX-License-Identifier: BSD-3-Clause
# The benchmark plot: page-table lookup latency versus regions, cache hit throughput versus
# threads; mrcache solid, UCX dashed, from the same run. Data files: mrcache-bench-report.
#
# usage: gnuplot -e "dir='bench-results'; have_lookup_mrcache=1; have_lookup_ucx=1; \
#                    have_hits_mrcache=1; have_hits_ucx=1" scripts/bench-report.gp
#   writes DIR/bench.png; a have_* variable 0 (or missing) leaves that series out
if (!exists("dir")) dir = "bench-results"
if (!exists("have_lookup_mrcache")) have_lookup_mrcache = 0
if (!exists("have_lookup_ucx")) have_lookup_ucx = 0
if (!exists("have_hits_mrcache")) have_hits_mrcache = 0
if (!exists("have_hits_ucx")) have_hits_ucx = 0

set terminal pngcairo size 1400,560 font "sans,11"
set output dir."/bench.png"
set multiplot layout 1,2 title "mrcache (solid) vs UCX (dashed), measured in the same run"
set grid
set key top left box opaque
set style data linespoints


set title "Page-table lookup latency (random hits; lower is better)"
set logscale x 10
set logscale y 2
set format x "10^{%T}"
set xlabel "regions in the table"
set ylabel "ns per lookup"
m = dir."/lookup-mrcache.dat"
u = dir."/lookup-ucx.dat"
if (have_lookup_mrcache && have_lookup_ucx) {
  plot for [i=0:*] m index i using 1:2 lc i+1 lw 2 pt 7 title columnheader(1), \
       for [i=0:*] u index i using 1:2 lc i+1 dt 2 lw 2 pt 6 title columnheader(1)
} else { if (have_lookup_mrcache) {
  plot for [i=0:*] m index i using 1:2 lc i+1 lw 2 pt 7 title columnheader(1)
} else {
  set label 1 "no PgtLookup figures in this run" at graph 0.5, 0.5 center
  plot [1:10] [1:10] NaN notitle
  unset label 1
} }

unset logscale
set format x "%g"
set title "Cache hit throughput (mrc\\_get + mrc\\_put of a cached region; higher is better)"
set xlabel "threads"
set ylabel "million hits per second (all threads)"
set xtics 1
set yrange [0:*]
set key bottom left
m = dir."/hits-mrcache.dat"
u = dir."/hits-ucx.dat"
if (have_hits_mrcache && have_hits_ucx) {
  plot for [i=0:*] m index i using 1:2 lc i+1 lw 2 pt 7 title columnheader(1), \
       for [i=0:*] u index i using 1:2 lc i+1 dt 2 lw 2 pt 6 title columnheader(1)
} else { if (have_hits_mrcache) {
  plot for [i=0:*] m index i using 1:2 lc i+1 lw 2 pt 7 title columnheader(1)
} else {
  set label 1 "no hit figures in this run" at graph 0.5, 0.5 center
  plot [1:2] [0:1] NaN notitle
} }
unset multiplot
