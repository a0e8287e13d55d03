"""The LLM arm: LOOP and VCBM-blended LOOP as a TRL GRPOTrainer subclass (paper 000 Sec. II-C, IV-B)."""
