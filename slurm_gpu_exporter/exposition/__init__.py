"""What a scrape serves: the frozen snapshot, the metric families made from it, bounded label
values. No I/O: nothing here reads the node (tests/test_layout.py checks it)."""
