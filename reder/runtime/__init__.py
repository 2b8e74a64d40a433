"""The inference trunk's fast paths: `onednn` (eval-mode REDER's trunk with oneDNN matmuls on weights reordered
once, attention in length groups; the default) and `compiled` (that trunk under torch.compile, an option)."""
