# The benchmark plot: page-table lookup latency versus regions, cache hit throughput versus
# threads, mrcache and UCX from the same run. Data files come from mrcache-bench-report.
#
# usage: gnuplot -e "dir='bench-results'; have_lookup=1; have_hits=1" scripts/bench-report.gp
#   writes DIR/bench.png
if (!exists("dir")) dir = "bench-results"
if (!exists("have_lookup")) have_lookup = 1
if (!exists("have_hits")) have_hits = 1

set terminal pngcairo size 1400,560 font "sans,11"
set output dir."/bench.png"
set multiplot layout 1,2 title "mrcache vs UCX, measured in the same run (scripts/bench.sh)"
set grid
set key top left box opaque
set style data linespoints

set title "Page-table lookup latency (random hits)"
set logscale x 10
set logscale y 2
set format x "10^{%T}"
set xlabel "regions in the table"
set ylabel "ns per lookup"
if (have_lookup) {
  plot for [i=0:*] dir."/lookup.dat" index i using 1:2 pointsize 1.2 linewidth 2 \
       title columnheader(1)
} else {
  set label 1 "no PgtLookup figures in this run" at graph 0.5, 0.5 center
  plot [1:10] [1:10] NaN notitle
  unset label 1
}

unset logscale
set format x "%g"
set title "Cache hit throughput (mrc_get + mrc_put of a cached region)"
set xlabel "threads"
set ylabel "million hits per second (all threads)"
set xtics 1
set yrange [0:*]
if (have_hits) {
  plot for [i=0:*] dir."/hits.dat" index i using 1:2 pointsize 1.2 linewidth 2 \
       title columnheader(1)
} else {
  set label 1 "no hit figures in this run" at graph 0.5, 0.5 center
  plot [1:2] [0:1] NaN notitle
}
unset multiplot
