#!/bin/sh
# Fashion-MNIST from the Debian package `dataset-fashion-mnist`, unpacked under DOWNLOADS/debian
# (`make setup` runs this). `apt-get download` and `dpkg-deb -x` need no root; only refreshing
# apt's package lists does, which we do when we are root and apt does not know the package yet.
set -eu
downloads=$1
package=dataset-fashion-mnist
target="$downloads/debian/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
[ -f "$target" ] && exit 0
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "fetch_fashion_mnist: apt-get and dpkg-deb are needed (a Debian or Ubuntu system). Put" \
       "the Fashion-MNIST IDX files (*-ubyte.gz) in $(dirname "$target") by hand." >&2
  exit 1
fi
mkdir -p "$downloads"
cd "$downloads"
if ! apt-get download -q "$package" >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get download -q "$package"
  else
    echo "fetch_fashion_mnist: 'apt-get download $package' failed. apt may not know the" \
         "package yet: run 'sudo apt-get update' and 'make setup' again (or install it with" \
         "'sudo apt-get install $package')." >&2
    exit 1
  fi
fi
dpkg-deb -x "${package}"_*_all.deb debian
rm "${package}"_*_all.deb
test -f "$target"
