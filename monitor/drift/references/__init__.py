"""Where a drift reference comes from (pinned, lagged, first records) and how it is stored."""
