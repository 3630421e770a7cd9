# The C token lane (_token_lane.c): the same API as the Python one, whose docs say what it does.
from .token_lane_py import TokenLane as TokenLane
