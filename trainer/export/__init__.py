"""The export stage: a trained model as a standard Hugging Face LlamaForCausalLM with the same logits."""
