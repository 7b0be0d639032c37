
x%333?(5fff?8B
BendH