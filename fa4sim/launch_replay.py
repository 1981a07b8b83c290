"""Moved to fa4sim/validate/launches.py; fa4sim/cli.py's cmd_validate imports these names until it
calls fa4sim.validate.main."""
from .validate.launches import compare as compare_launches  # noqa: F401
from .validate.launches import replay_one_cta_per_tile, replay_persistent, report as report_launches, tile_kinds  # noqa: F401


def is_cta_log_file(doc: dict) -> bool:
    return doc["meta"]["kind"] == "cta_log"
