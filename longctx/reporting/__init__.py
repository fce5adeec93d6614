"""What a person watching a run sees: a progress bar or plain lines (progress.py) and Weights &
Biases logging (wandb_log.py)."""
