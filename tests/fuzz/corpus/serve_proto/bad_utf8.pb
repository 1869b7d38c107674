
Ã("cross_entropy