"""Rewrites: plan -> bounded relation as a sqlglot AST; render is the one place AST becomes text."""
