"""Writes sales.csv: 4,000 rows of made-up sales, the same every time (seeded).

usage: python3 make_sales.py [OUT]   (default: sales.csv beside this script)
"""
import csv
import pathlib
import random
import sys

out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).with_name("sales.csv")
rng = random.Random(20261129)
regions = ["north", "south", "east", "west"]
with out.open("w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["order_id", "region", "units", "price"])
    for order_id in range(1, 4001):
        writer.writerow([order_id, rng.choice(regions), rng.randint(1, 50), f"{rng.lognormvariate(3, 0.6):.2f}"])
