#!/bin/sh
# Put EdgeSpec into the desktop's application menu for this user: run it from the bundle folder
# (dist/edgespec/install-desktop.sh) wherever the folder was copied to. Nothing needs root.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
data="${XDG_DATA_HOME:-$HOME/.local/share}"
mkdir -p "$data/applications" "$data/icons/hicolor/256x256/apps" "$data/icons/hicolor/scalable/apps"
cp "$here/edgespec.png" "$data/icons/hicolor/256x256/apps/edgespec.png"
cp "$here/edgespec.svg" "$data/icons/hicolor/scalable/apps/edgespec.svg"
sed "s|@BUNDLE@|$here|g" "$here/edgespec.desktop" > "$data/applications/edgespec.desktop"
command -v update-desktop-database >/dev/null 2>&1 && update-desktop-database "$data/applications" || true
echo "installed $data/applications/edgespec.desktop (starts $here/edgespec)"
