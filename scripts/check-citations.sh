#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every section of docs/DESIGN.md that the repository cites exists. Code comments, scripts and
# docs cite the design by section name (docs/DESIGN.md, "Churn"); a section renamed or removed
# leaves those citations pointing nowhere. A citation names a heading (## or ###) exactly, or
# the heading without its closing parenthesis ("Kernel facts probed on this machine" for
# "Kernel facts probed on this machine (kernel 6.18, Debian 12)"), or a paragraph's bold label
# ("User code" for a paragraph that opens "**User code.**"). A citation may continue on
# the next comment line. In code (.cc, .h, .c) a citation must name a section.
#
# usage: scripts/check-citations.sh      exit 1 and the citations that name no section
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

design=docs/DESIGN.md
mapfile -t files < <(git ls-files -- ':!docs/DESIGN.md' ':!*.png' ':!tests/fuzz/corpus/*' \
  ':!tests/fuzz/regressions/*' ':!tests/abi/v0.1/*')

perl -e '
  use strict; use warnings;
  my $design = shift @ARGV;
  my %sections;
  open(my $d, "<", $design) or die "check-citations: $design: $!\n";
  while (<$d>) {
    # A paragraph that opens with a bold label ("**User code.**") is cited by it too.
    $sections{$1} = 1 if /^(?:-\s+)?\*\*([^*]+?)\.?\*\*/;
    next unless /^#{2,3}\s+(.*?)\s*$/;
    my $title = $1;
    $sections{$title} = 1;
    (my $short = $title) =~ s/\s*\([^()]*\)$//;
    $sections{$short} = 1;
  }
  close $d;
  my ($cited, @bad) = (0);
  for my $file (@ARGV) {
    open(my $f, "<", $file) or next;
    my @lines = <$f>;
    close $f;
    # Comment leaders out, lines joined: a citation may break across comment lines.
    my ($text, @line_of) = ("");
    for my $i (0 .. $#lines) {
      (my $l = $lines[$i]) =~ s{^\s*(?://+|#+|\*+|;+)?\s?}{};
      $l =~ s/\s+$//;
      push @line_of, [length($text), $i + 1];
      $text .= $l . " ";
    }
    my $code = $file =~ /\.(?:cc|h|c|hpp)$/;
    while ($text =~ /DESIGN\.md(?:[,:]?\s+\(?(?:sections?\s+)?("[^"]+"(?:\s*(?:,|and)\s*"[^"]+")*))?/g) {
      my ($list, $at) = ($1, $-[0]);
      my $line = 1;
      for (@line_of) { last if $_->[0] > $at; $line = $_->[1]; }
      if (!defined $list) {
        push @bad, "$file:$line: names no section" if $code;
        next;
      }
      while ($list =~ /"([^"]+)"/g) {
        (my $title = $1) =~ s/\s+/ /g;
        $cited++;
        push @bad, "$file:$line: \"$title\"" unless $sections{$title};
      }
    }
  }
  if (@bad) {
    print "check-citations: these cite no section of $design:\n";
    print "  $_\n" for @bad;
    exit 1;
  }
  print "check-citations: $cited citations of $design, each names a section\n";
' "$design" "${files[@]}"
