"""The worker side: owns weights, the KV cache, input building, forward and sampling."""
