"""The LLM arm: LOOP and VCBM-blended LOOP as a TRL GRPOTrainer subclass (VCBM paper, arXiv:2610.24032,
Sec. II-C, IV-B; docs/papers/vcbm.md)."""
