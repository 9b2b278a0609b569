"""The driver's sample stream: its clocks, the sample buffers and their cursors,
gaps and events, and busy time integrated from the samples."""
