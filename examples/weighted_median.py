# The weighted median of price, weighted by units sold, over /work/sales.csv.
import json

import pandas as pd

sales = pd.read_csv("/work/sales.csv")
ordered = sales.sort_values("price")
cumulative = ordered["units"].cumsum()
half = ordered["units"].sum() / 2
weighted_median = float(ordered.loc[cumulative >= half, "price"].iloc[0])

with open("/work/out.json", "w") as f:
    json.dump({"rows": len(sales), "weighted_median": weighted_median}, f)
print(f"weighted median price: {weighted_median}")
weighted_median
