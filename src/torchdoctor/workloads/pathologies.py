"""Names of the demo job's switchable pathologies (importable without torch)."""

PATHOLOGIES = {
    "main_process_loader": "DataLoader decodes in the training process (num_workers=0)",
    "no_pin_memory": "DataLoader(pin_memory=False)",
    "syncing_collate": "collate_fn converts every sample via .numpy()/lists and .item()",
    "loss_item_every_step": "loss.item() every step",
    "find_unused_parameters": "DDP(find_unused_parameters=True) with no unused parameter",
    "small_buckets": "DDP(bucket_cap_mb=0.001): one all-reduce per layer",
    "allocator_churn": "glibc malloc's default thresholds: the step's activations are unmapped and faulted in again",
    "module_on_wrong_device": "a frozen classifier head left on the CPU (GPU only)",
    "fp32_matmul": "float32 matmuls at 'highest' precision (GPU only)",
}
GPU_ONLY = frozenset({"module_on_wrong_device", "fp32_matmul"})
