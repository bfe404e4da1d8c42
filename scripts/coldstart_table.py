"""One command's rounds from scripts/coldstart (`/usr/bin/time -f "%e %M"` lines) as one line: median wall
seconds and peak RSS. python3 scripts/coldstart_table.py TIMES_FILE COMMAND"""
import statistics
import sys

rows = [line.split() for line in open(sys.argv[1])]
wall, rss = [float(r[0]) for r in rows], [int(r[1]) / 1024 for r in rows]
print(f"{statistics.median(wall):6.2f} s wall (min {min(wall):.2f}, max {max(wall):.2f})  "
      f"{statistics.median(rss):6.0f} MB peak RSS  {sys.argv[2]}")
