"""Wire protocol: length-prefixed frames carrying a JSON header and raw tensor bytes.

Standard library and numpy only; no pickle on any socket, so a client can never make the
server execute code by sending a crafted frame.
"""
