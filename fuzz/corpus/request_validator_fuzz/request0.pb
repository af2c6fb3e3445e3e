Hello there*333?fff?HZ
ZENDh