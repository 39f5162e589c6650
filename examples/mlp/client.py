"""Send a few requests to the example model and print what comes back.

python examples/mlp/client.py [--config examples/mlp/hotreload.toml] [-n 5]
"""

import argparse
import time
from pathlib import Path

import numpy as np

from hotreload import Client


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(Path(__file__).with_name("hotreload.toml")))
    parser.add_argument("-n", type=int, default=5, help="how many requests")
    args = parser.parse_args()
    client = Client(config=args.config)
    x = np.random.default_rng(0).standard_normal((1, 64), dtype=np.float32)
    for _ in range(args.n):
        t0 = time.perf_counter()
        out, version = client.infer("mlp", x)[:2]
        ms = (time.perf_counter() - t0) * 1000
        print(f"v{version}  {ms:6.2f} ms  output[:4] = {np.round(out[0, :4], 4).tolist()}")
        time.sleep(0.2)


if __name__ == "__main__":
    main()
