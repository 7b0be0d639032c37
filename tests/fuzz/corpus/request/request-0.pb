
Hello