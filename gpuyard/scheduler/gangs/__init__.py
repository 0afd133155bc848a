"""What a job asks (plain gang requests built from a PodGroup) and what placement answers
(a placement, or typed reasons why it cannot be placed now)."""
