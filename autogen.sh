#!/bin/sh
#
# Generate configure and Makefile.in from configure.ac and Makefile.am.
# Needs autoconf, automake, libtool and pkg-config.
#
set -e
cd "$(dirname "$0")"
mkdir -p m4 build-aux
autoreconf -fiv
