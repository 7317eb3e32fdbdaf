"""thorfleet: custom facts, operations and settings for the Thor deploy."""
