"""Recovery: incidents, whose fault each is, the tier carried out, and the generations re-formed in place."""
