
	été ☃Rwindow