"""Draw docs/figures/scene.png: a synthetic scene (sky, grass, house, tree, sun) for `swin show attention`
in the README; no photograph ships with the repository."""

from pathlib import Path

from PIL import Image, ImageDraw

image = Image.new("RGB", (256, 256))
draw = ImageDraw.Draw(image)
for y in range(256):
    draw.line([(0, y), (255, y)], fill=(110 + y // 4, 160 + y // 5, 230))
draw.rectangle([0, 180, 255, 255], fill=(86, 150, 64))
draw.ellipse([178, 22, 234, 78], fill=(250, 214, 60))
draw.rectangle([36, 112, 136, 196], fill=(190, 70, 52))
draw.polygon([(24, 114), (86, 58), (148, 114)], fill=(110, 40, 36))
draw.rectangle([74, 150, 98, 196], fill=(80, 50, 30))
draw.rectangle([48, 128, 68, 146], fill=(240, 240, 200))
draw.rectangle([106, 128, 126, 146], fill=(240, 240, 200))
draw.rectangle([190, 120, 202, 196], fill=(100, 70, 40))
draw.ellipse([164, 84, 228, 142], fill=(40, 110, 50))
image.save(Path(__file__).with_name("scene.png"))
