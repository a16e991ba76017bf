"""Draw EdgeSpec's icon (edgespec.svg and edgespec.png, 256x256): a row of tokens coloured like the
UI's highlighting - accepted draft tokens (green), the target's own token (outlined) and a bonus
token (cyan) - under a forward chevron. `python packaging/desktop/make_icon.py` rewrites both."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZE = 256
BG, GREEN, CYAN, WHITE = "#1e293b", "#22c55e", "#22d3ee", "#f8fafc"
# (x, y, w, h, fill or None for outlined) of the token blocks
TOKENS = [(28, 150, 44, 60, GREEN), (80, 150, 44, 60, GREEN), (132, 150, 44, 60, None), (184, 150, 44, 60, CYAN)]
CHEVRON = [(60, 50), (196, 98), (60, 122)]  # a filled "play/forward" triangle


def svg() -> str:
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SIZE}" height="{SIZE}" viewBox="0 0 {SIZE} {SIZE}">',
             f'<rect x="8" y="8" width="240" height="240" rx="44" fill="{BG}"/>',
             '<polygon points="{}" fill="{}"/>'.format(" ".join(f"{x},{y}" for x, y in CHEVRON), WHITE)]
    for x, y, w, h, fill in TOKENS:
        if fill:
            parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}"/>')
        else:
            parts.append(f'<rect x="{x + 3}" y="{y + 3}" width="{w - 6}" height="{h - 6}" rx="6" fill="none" '
                         f'stroke="{WHITE}" stroke-width="6"/>')
    return "\n".join([*parts, "</svg>", ""])


def png(path: Path) -> None:
    from PIL import Image, ImageDraw  # Pillow comes with Gradio

    scale = 4  # draw large, then downsample: smooth edges
    img = Image.new("RGBA", (SIZE * scale, SIZE * scale), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    d.rounded_rectangle([8 * scale, 8 * scale, 248 * scale, 248 * scale], radius=44 * scale, fill=BG)
    d.polygon([(x * scale, y * scale) for x, y in CHEVRON], fill=WHITE)
    for x, y, w, h, fill in TOKENS:
        box = [x * scale, y * scale, (x + w) * scale, (y + h) * scale]
        if fill:
            d.rounded_rectangle(box, radius=8 * scale, fill=fill)
        else:
            d.rounded_rectangle(box, radius=8 * scale, outline=WHITE, width=6 * scale)
    img.resize((SIZE, SIZE), Image.LANCZOS).save(path, optimize=True)


if __name__ == "__main__":
    (HERE / "edgespec.svg").write_text(svg())
    png(HERE / "edgespec.png")
    print(f"wrote {HERE / 'edgespec.svg'} and {HERE / 'edgespec.png'}")
