"""The detokenizer process: token ids from the scheduler in, text deltas to the frontend out."""
