#!/usr/bin/env python3
"""Screenshot a `rao report` page in headless Chromium (Debian: `apt-get install chromium`) and
cut it into tiles a person (or an image viewer) can read: check_report.py PAGE.html OUT_DIR
Prints one PNG path per tile. Needs Pillow (installed with the test tools by scripts/test)."""
import os
import shutil
import subprocess
import sys
import tempfile

from PIL import Image, ImageChops

WIDTH, TILE, TALL = 1280, 1400, 16000

page, out = os.path.realpath(sys.argv[1]), sys.argv[2]
os.makedirs(out, exist_ok=True)
browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
if browser is None:
    sys.exit("no Chromium found: apt-get install chromium")
with tempfile.TemporaryDirectory() as tmp:
    full = os.path.join(tmp, "full.png")
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={WIDTH},{TALL}", f"--screenshot={full}", "file://" + page],
        check=True, capture_output=True, timeout=120,
    )
    img = Image.open(full).convert("RGB")
    # Cut the white below the page's end.
    box = ImageChops.difference(img, Image.new("RGB", img.size, "white")).getbbox()
    height = box[3] + 20 if box else img.height
    for k, top in enumerate(range(0, height, TILE)):
        path = os.path.join(out, f"page-{k + 1}.png")
        img.crop((0, top, WIDTH, min(top + TILE, height))).save(path)
        print(path)
