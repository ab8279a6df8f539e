"""Stock Flower apps for the SuperLink capacity benchmark."""
