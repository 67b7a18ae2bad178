# SPDX-License-Identifier: BSD-3-Clause
# The application plot: for each engine (null, io_uring) and binding (unbound, bound to one CPU),
# mrcache's time per message as a ratio to UCX's rcache and to no cache, per workload; below the
# line at 1 mrcache is faster. Data files: mrcache-appbench -o DIR (app-<engine>-<binding>.dat).
#
# usage: gnuplot -e "dir='bench-results'" scripts/appbench.gp   (writes DIR/app.png)
if (!exists("dir")) dir = "bench-results"

set terminal pngcairo size 1600,1000 font "sans,10"
set output dir."/app.png"
set multiplot layout 2,2 title "mrcache / UCX and mrcache / no cache per application workload (medians of per-repetition ratios; lower is better)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set grid ytics
set xtics rotate by -40 noenhanced
set logscale y 2
set yrange [0.01:8]
set ylabel "ratio"
set key tmargin center horizontal

do for [engine in "null iouring"] {
  do for [binding in "unbound bound"] {
    f = dir."/app-".engine."-".binding.".dat"
    set title sprintf("%s engine, %s", engine, binding eq "bound" ? "bound to one CPU" : "unbound") noenhanced
    if (system("test -s ".f." && echo 1 || echo 0") + 0) {
      plot f using 2:xtic(1) title columnheader(2), \
           '' using 3 title columnheader(3), \
           '' using 4 title columnheader(4), \
           '' using 5 title columnheader(5), \
           1 with lines lc rgb "black" dt 2 notitle
    } else {
      set label 1 "no figures for this engine and binding" at graph 0.5, 0.5 center
      plot [0:1] NaN notitle
      unset label 1
    }
  }
}
unset multiplot
