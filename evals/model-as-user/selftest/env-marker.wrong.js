return "0123456789abcdef";
