"""Sources and the decoding of what they deliver (monitor/sources, monitor/decoding/decoder.py, monitor/json_*)."""
