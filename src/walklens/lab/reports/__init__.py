"""The lab's reports: the sweep, the agreement study, the steering card."""
