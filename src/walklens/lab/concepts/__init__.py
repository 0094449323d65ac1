"""Concept vectors on HellaSwag (seed 000, Tests 1 and 2): segments of an item, scored generations, similarity."""
