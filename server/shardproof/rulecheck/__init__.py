"""Checks of the rule library on concrete tensors.

Every rule's own egglog text is read back (sexpr), its terms and relations are given their meaning
in torch (meaning), and each rule is instantiated on random float64 tensors for several shapes and
world sizes (instances) and checked: premises hold, so every conclusion must hold too (harness).
Rules with side conditions also get near misses: instances their side conditions reject, on which
the conclusion would indeed be false.
"""
