NAME        problem
ROWS
 N  obj     
 G  soc_lo01
 L  soc_hi01
 G  soc_lo02
 L  soc_hi02
 G  soc_lo03
 L  soc_hi03
 G  soc_lo04
 L  soc_hi04
 G  soc_lo05
 L  soc_hi05
 G  soc_lo06
 L  soc_hi06
 G  soc_lo07
 L  soc_hi07
 G  soc_lo08
 L  soc_hi08
 G  soc_lo09
 L  soc_hi09
 G  soc_lo10
 L  soc_hi10
 G  soc_lo11
 L  soc_hi11
 G  soc_lo12
 L  soc_hi12
 G  soc_lo13
 L  soc_hi13
 G  soc_lo14
 L  soc_hi14
 G  soc_lo15
 L  soc_hi15
 G  soc_lo16
 L  soc_hi16
 G  soc_lo17
 L  soc_hi17
 G  soc_lo18
 L  soc_hi18
 G  soc_lo19
 L  soc_hi19
 G  soc_lo20
 L  soc_hi20
 G  soc_lo21
 L  soc_hi21
 G  soc_lo22
 L  soc_hi22
 G  soc_lo23
 L  soc_hi23
 E  end     
COLUMNS
    h01       obj       1
    h01       soc_lo01  1
    h01       soc_hi01  1
    h01       soc_lo02  1
    h01       soc_hi02  1
    h01       soc_lo03  1
    h01       soc_hi03  1
    h01       soc_lo04  1
    h01       soc_hi04  1
    h01       soc_lo05  1
    h01       soc_hi05  1
    h01       soc_lo06  1
    h01       soc_hi06  1
    h01       soc_lo07  1
    h01       soc_hi07  1
    h01       soc_lo08  1
    h01       soc_hi08  1
    h01       soc_lo09  1
    h01       soc_hi09  1
    h01       soc_lo10  1
    h01       soc_hi10  1
    h01       soc_lo11  1
    h01       soc_hi11  1
    h01       soc_lo12  1
    h01       soc_hi12  1
    h01       soc_lo13  1
    h01       soc_hi13  1
    h01       soc_lo14  1
    h01       soc_hi14  1
    h01       soc_lo15  1
    h01       soc_hi15  1
    h01       soc_lo16  1
    h01       soc_hi16  1
    h01       soc_lo17  1
    h01       soc_hi17  1
    h01       soc_lo18  1
    h01       soc_hi18  1
    h01       soc_lo19  1
    h01       soc_hi19  1
    h01       soc_lo20  1
    h01       soc_hi20  1
    h01       soc_lo21  1
    h01       soc_hi21  1
    h01       soc_lo22  1
    h01       soc_hi22  1
    h01       soc_lo23  1
    h01       soc_hi23  1
    h01       end       1
    h02       obj       1
    h02       soc_lo02  1
    h02       soc_hi02  1
    h02       soc_lo03  1
    h02       soc_hi03  1
    h02       soc_lo04  1
    h02       soc_hi04  1
    h02       soc_lo05  1
    h02       soc_hi05  1
    h02       soc_lo06  1
    h02       soc_hi06  1
    h02       soc_lo07  1
    h02       soc_hi07  1
    h02       soc_lo08  1
    h02       soc_hi08  1
    h02       soc_lo09  1
    h02       soc_hi09  1
    h02       soc_lo10  1
    h02       soc_hi10  1
    h02       soc_lo11  1
    h02       soc_hi11  1
    h02       soc_lo12  1
    h02       soc_hi12  1
    h02       soc_lo13  1
    h02       soc_hi13  1
    h02       soc_lo14  1
    h02       soc_hi14  1
    h02       soc_lo15  1
    h02       soc_hi15  1
    h02       soc_lo16  1
    h02       soc_hi16  1
    h02       soc_lo17  1
    h02       soc_hi17  1
    h02       soc_lo18  1
    h02       soc_hi18  1
    h02       soc_lo19  1
    h02       soc_hi19  1
    h02       soc_lo20  1
    h02       soc_hi20  1
    h02       soc_lo21  1
    h02       soc_hi21  1
    h02       soc_lo22  1
    h02       soc_hi22  1
    h02       soc_lo23  1
    h02       soc_hi23  1
    h02       end       1
    h03       obj       1
    h03       soc_lo03  1
    h03       soc_hi03  1
    h03       soc_lo04  1
    h03       soc_hi04  1
    h03       soc_lo05  1
    h03       soc_hi05  1
    h03       soc_lo06  1
    h03       soc_hi06  1
    h03       soc_lo07  1
    h03       soc_hi07  1
    h03       soc_lo08  1
    h03       soc_hi08  1
    h03       soc_lo09  1
    h03       soc_hi09  1
    h03       soc_lo10  1
    h03       soc_hi10  1
    h03       soc_lo11  1
    h03       soc_hi11  1
    h03       soc_lo12  1
    h03       soc_hi12  1
    h03       soc_lo13  1
    h03       soc_hi13  1
    h03       soc_lo14  1
    h03       soc_hi14  1
    h03       soc_lo15  1
    h03       soc_hi15  1
    h03       soc_lo16  1
    h03       soc_hi16  1
    h03       soc_lo17  1
    h03       soc_hi17  1
    h03       soc_lo18  1
    h03       soc_hi18  1
    h03       soc_lo19  1
    h03       soc_hi19  1
    h03       soc_lo20  1
    h03       soc_hi20  1
    h03       soc_lo21  1
    h03       soc_hi21  1
    h03       soc_lo22  1
    h03       soc_hi22  1
    h03       soc_lo23  1
    h03       soc_hi23  1
    h03       end       1
    h04       obj       1
    h04       soc_lo04  1
    h04       soc_hi04  1
    h04       soc_lo05  1
    h04       soc_hi05  1
    h04       soc_lo06  1
    h04       soc_hi06  1
    h04       soc_lo07  1
    h04       soc_hi07  1
    h04       soc_lo08  1
    h04       soc_hi08  1
    h04       soc_lo09  1
    h04       soc_hi09  1
    h04       soc_lo10  1
    h04       soc_hi10  1
    h04       soc_lo11  1
    h04       soc_hi11  1
    h04       soc_lo12  1
    h04       soc_hi12  1
    h04       soc_lo13  1
    h04       soc_hi13  1
    h04       soc_lo14  1
    h04       soc_hi14  1
    h04       soc_lo15  1
    h04       soc_hi15  1
    h04       soc_lo16  1
    h04       soc_hi16  1
    h04       soc_lo17  1
    h04       soc_hi17  1
    h04       soc_lo18  1
    h04       soc_hi18  1
    h04       soc_lo19  1
    h04       soc_hi19  1
    h04       soc_lo20  1
    h04       soc_hi20  1
    h04       soc_lo21  1
    h04       soc_hi21  1
    h04       soc_lo22  1
    h04       soc_hi22  1
    h04       soc_lo23  1
    h04       soc_hi23  1
    h04       end       1
    h05       obj       1
    h05       soc_lo05  1
    h05       soc_hi05  1
    h05       soc_lo06  1
    h05       soc_hi06  1
    h05       soc_lo07  1
    h05       soc_hi07  1
    h05       soc_lo08  1
    h05       soc_hi08  1
    h05       soc_lo09  1
    h05       soc_hi09  1
    h05       soc_lo10  1
    h05       soc_hi10  1
    h05       soc_lo11  1
    h05       soc_hi11  1
    h05       soc_lo12  1
    h05       soc_hi12  1
    h05       soc_lo13  1
    h05       soc_hi13  1
    h05       soc_lo14  1
    h05       soc_hi14  1
    h05       soc_lo15  1
    h05       soc_hi15  1
    h05       soc_lo16  1
    h05       soc_hi16  1
    h05       soc_lo17  1
    h05       soc_hi17  1
    h05       soc_lo18  1
    h05       soc_hi18  1
    h05       soc_lo19  1
    h05       soc_hi19  1
    h05       soc_lo20  1
    h05       soc_hi20  1
    h05       soc_lo21  1
    h05       soc_hi21  1
    h05       soc_lo22  1
    h05       soc_hi22  1
    h05       soc_lo23  1
    h05       soc_hi23  1
    h05       end       1
    h06       obj       1
    h06       soc_lo06  1
    h06       soc_hi06  1
    h06       soc_lo07  1
    h06       soc_hi07  1
    h06       soc_lo08  1
    h06       soc_hi08  1
    h06       soc_lo09  1
    h06       soc_hi09  1
    h06       soc_lo10  1
    h06       soc_hi10  1
    h06       soc_lo11  1
    h06       soc_hi11  1
    h06       soc_lo12  1
    h06       soc_hi12  1
    h06       soc_lo13  1
    h06       soc_hi13  1
    h06       soc_lo14  1
    h06       soc_hi14  1
    h06       soc_lo15  1
    h06       soc_hi15  1
    h06       soc_lo16  1
    h06       soc_hi16  1
    h06       soc_lo17  1
    h06       soc_hi17  1
    h06       soc_lo18  1
    h06       soc_hi18  1
    h06       soc_lo19  1
    h06       soc_hi19  1
    h06       soc_lo20  1
    h06       soc_hi20  1
    h06       soc_lo21  1
    h06       soc_hi21  1
    h06       soc_lo22  1
    h06       soc_hi22  1
    h06       soc_lo23  1
    h06       soc_hi23  1
    h06       end       1
    h07       obj       1
    h07       soc_lo07  1
    h07       soc_hi07  1
    h07       soc_lo08  1
    h07       soc_hi08  1
    h07       soc_lo09  1
    h07       soc_hi09  1
    h07       soc_lo10  1
    h07       soc_hi10  1
    h07       soc_lo11  1
    h07       soc_hi11  1
    h07       soc_lo12  1
    h07       soc_hi12  1
    h07       soc_lo13  1
    h07       soc_hi13  1
    h07       soc_lo14  1
    h07       soc_hi14  1
    h07       soc_lo15  1
    h07       soc_hi15  1
    h07       soc_lo16  1
    h07       soc_hi16  1
    h07       soc_lo17  1
    h07       soc_hi17  1
    h07       soc_lo18  1
    h07       soc_hi18  1
    h07       soc_lo19  1
    h07       soc_hi19  1
    h07       soc_lo20  1
    h07       soc_hi20  1
    h07       soc_lo21  1
    h07       soc_hi21  1
    h07       soc_lo22  1
    h07       soc_hi22  1
    h07       soc_lo23  1
    h07       soc_hi23  1
    h07       end       1
    h08       obj       1
    h08       soc_lo08  1
    h08       soc_hi08  1
    h08       soc_lo09  1
    h08       soc_hi09  1
    h08       soc_lo10  1
    h08       soc_hi10  1
    h08       soc_lo11  1
    h08       soc_hi11  1
    h08       soc_lo12  1
    h08       soc_hi12  1
    h08       soc_lo13  1
    h08       soc_hi13  1
    h08       soc_lo14  1
    h08       soc_hi14  1
    h08       soc_lo15  1
    h08       soc_hi15  1
    h08       soc_lo16  1
    h08       soc_hi16  1
    h08       soc_lo17  1
    h08       soc_hi17  1
    h08       soc_lo18  1
    h08       soc_hi18  1
    h08       soc_lo19  1
    h08       soc_hi19  1
    h08       soc_lo20  1
    h08       soc_hi20  1
    h08       soc_lo21  1
    h08       soc_hi21  1
    h08       soc_lo22  1
    h08       soc_hi22  1
    h08       soc_lo23  1
    h08       soc_hi23  1
    h08       end       1
    h09       obj       1
    h09       soc_lo09  1
    h09       soc_hi09  1
    h09       soc_lo10  1
    h09       soc_hi10  1
    h09       soc_lo11  1
    h09       soc_hi11  1
    h09       soc_lo12  1
    h09       soc_hi12  1
    h09       soc_lo13  1
    h09       soc_hi13  1
    h09       soc_lo14  1
    h09       soc_hi14  1
    h09       soc_lo15  1
    h09       soc_hi15  1
    h09       soc_lo16  1
    h09       soc_hi16  1
    h09       soc_lo17  1
    h09       soc_hi17  1
    h09       soc_lo18  1
    h09       soc_hi18  1
    h09       soc_lo19  1
    h09       soc_hi19  1
    h09       soc_lo20  1
    h09       soc_hi20  1
    h09       soc_lo21  1
    h09       soc_hi21  1
    h09       soc_lo22  1
    h09       soc_hi22  1
    h09       soc_lo23  1
    h09       soc_hi23  1
    h09       end       1
    h10       obj       1
    h10       soc_lo10  1
    h10       soc_hi10  1
    h10       soc_lo11  1
    h10       soc_hi11  1
    h10       soc_lo12  1
    h10       soc_hi12  1
    h10       soc_lo13  1
    h10       soc_hi13  1
    h10       soc_lo14  1
    h10       soc_hi14  1
    h10       soc_lo15  1
    h10       soc_hi15  1
    h10       soc_lo16  1
    h10       soc_hi16  1
    h10       soc_lo17  1
    h10       soc_hi17  1
    h10       soc_lo18  1
    h10       soc_hi18  1
    h10       soc_lo19  1
    h10       soc_hi19  1
    h10       soc_lo20  1
    h10       soc_hi20  1
    h10       soc_lo21  1
    h10       soc_hi21  1
    h10       soc_lo22  1
    h10       soc_hi22  1
    h10       soc_lo23  1
    h10       soc_hi23  1
    h10       end       1
    h11       obj       1
    h11       soc_lo11  1
    h11       soc_hi11  1
    h11       soc_lo12  1
    h11       soc_hi12  1
    h11       soc_lo13  1
    h11       soc_hi13  1
    h11       soc_lo14  1
    h11       soc_hi14  1
    h11       soc_lo15  1
    h11       soc_hi15  1
    h11       soc_lo16  1
    h11       soc_hi16  1
    h11       soc_lo17  1
    h11       soc_hi17  1
    h11       soc_lo18  1
    h11       soc_hi18  1
    h11       soc_lo19  1
    h11       soc_hi19  1
    h11       soc_lo20  1
    h11       soc_hi20  1
    h11       soc_lo21  1
    h11       soc_hi21  1
    h11       soc_lo22  1
    h11       soc_hi22  1
    h11       soc_lo23  1
    h11       soc_hi23  1
    h11       end       1
    h12       obj       1
    h12       soc_lo12  1
    h12       soc_hi12  1
    h12       soc_lo13  1
    h12       soc_hi13  1
    h12       soc_lo14  1
    h12       soc_hi14  1
    h12       soc_lo15  1
    h12       soc_hi15  1
    h12       soc_lo16  1
    h12       soc_hi16  1
    h12       soc_lo17  1
    h12       soc_hi17  1
    h12       soc_lo18  1
    h12       soc_hi18  1
    h12       soc_lo19  1
    h12       soc_hi19  1
    h12       soc_lo20  1
    h12       soc_hi20  1
    h12       soc_lo21  1
    h12       soc_hi21  1
    h12       soc_lo22  1
    h12       soc_hi22  1
    h12       soc_lo23  1
    h12       soc_hi23  1
    h12       end       1
    h13       obj       1
    h13       soc_lo13  1
    h13       soc_hi13  1
    h13       soc_lo14  1
    h13       soc_hi14  1
    h13       soc_lo15  1
    h13       soc_hi15  1
    h13       soc_lo16  1
    h13       soc_hi16  1
    h13       soc_lo17  1
    h13       soc_hi17  1
    h13       soc_lo18  1
    h13       soc_hi18  1
    h13       soc_lo19  1
    h13       soc_hi19  1
    h13       soc_lo20  1
    h13       soc_hi20  1
    h13       soc_lo21  1
    h13       soc_hi21  1
    h13       soc_lo22  1
    h13       soc_hi22  1
    h13       soc_lo23  1
    h13       soc_hi23  1
    h13       end       1
    h14       obj       1
    h14       soc_lo14  1
    h14       soc_hi14  1
    h14       soc_lo15  1
    h14       soc_hi15  1
    h14       soc_lo16  1
    h14       soc_hi16  1
    h14       soc_lo17  1
    h14       soc_hi17  1
    h14       soc_lo18  1
    h14       soc_hi18  1
    h14       soc_lo19  1
    h14       soc_hi19  1
    h14       soc_lo20  1
    h14       soc_hi20  1
    h14       soc_lo21  1
    h14       soc_hi21  1
    h14       soc_lo22  1
    h14       soc_hi22  1
    h14       soc_lo23  1
    h14       soc_hi23  1
    h14       end       1
    h15       obj       1
    h15       soc_lo15  1
    h15       soc_hi15  1
    h15       soc_lo16  1
    h15       soc_hi16  1
    h15       soc_lo17  1
    h15       soc_hi17  1
    h15       soc_lo18  1
    h15       soc_hi18  1
    h15       soc_lo19  1
    h15       soc_hi19  1
    h15       soc_lo20  1
    h15       soc_hi20  1
    h15       soc_lo21  1
    h15       soc_hi21  1
    h15       soc_lo22  1
    h15       soc_hi22  1
    h15       soc_lo23  1
    h15       soc_hi23  1
    h15       end       1
    h16       obj       1
    h16       soc_lo16  1
    h16       soc_hi16  1
    h16       soc_lo17  1
    h16       soc_hi17  1
    h16       soc_lo18  1
    h16       soc_hi18  1
    h16       soc_lo19  1
    h16       soc_hi19  1
    h16       soc_lo20  1
    h16       soc_hi20  1
    h16       soc_lo21  1
    h16       soc_hi21  1
    h16       soc_lo22  1
    h16       soc_hi22  1
    h16       soc_lo23  1
    h16       soc_hi23  1
    h16       end       1
    h17       obj       1
    h17       soc_lo17  1
    h17       soc_hi17  1
    h17       soc_lo18  1
    h17       soc_hi18  1
    h17       soc_lo19  1
    h17       soc_hi19  1
    h17       soc_lo20  1
    h17       soc_hi20  1
    h17       soc_lo21  1
    h17       soc_hi21  1
    h17       soc_lo22  1
    h17       soc_hi22  1
    h17       soc_lo23  1
    h17       soc_hi23  1
    h17       end       1
    h18       obj       1
    h18       soc_lo18  1
    h18       soc_hi18  1
    h18       soc_lo19  1
    h18       soc_hi19  1
    h18       soc_lo20  1
    h18       soc_hi20  1
    h18       soc_lo21  1
    h18       soc_hi21  1
    h18       soc_lo22  1
    h18       soc_hi22  1
    h18       soc_lo23  1
    h18       soc_hi23  1
    h18       end       1
    h19       obj       1
    h19       soc_lo19  1
    h19       soc_hi19  1
    h19       soc_lo20  1
    h19       soc_hi20  1
    h19       soc_lo21  1
    h19       soc_hi21  1
    h19       soc_lo22  1
    h19       soc_hi22  1
    h19       soc_lo23  1
    h19       soc_hi23  1
    h19       end       1
    h20       obj       1
    h20       soc_lo20  1
    h20       soc_hi20  1
    h20       soc_lo21  1
    h20       soc_hi21  1
    h20       soc_lo22  1
    h20       soc_hi22  1
    h20       soc_lo23  1
    h20       soc_hi23  1
    h20       end       1
    h21       obj       1
    h21       soc_lo21  1
    h21       soc_hi21  1
    h21       soc_lo22  1
    h21       soc_hi22  1
    h21       soc_lo23  1
    h21       soc_hi23  1
    h21       end       1
    h22       obj       1
    h22       soc_lo22  1
    h22       soc_hi22  1
    h22       soc_lo23  1
    h22       soc_hi23  1
    h22       end       1
    h23       obj       1
    h23       soc_lo23  1
    h23       soc_hi23  1
    h23       end       1
    h24       obj       1
    h24       end       1
RHS
    RHS_V     soc_lo01  0.11
    RHS_V     soc_hi01  3.1099999999999999
    RHS_V     soc_lo02  0.25
    RHS_V     soc_hi02  3.25
    RHS_V     soc_lo03  0.438
    RHS_V     soc_hi03  3.4380000000000002
    RHS_V     soc_lo04  0.68799999999999994
    RHS_V     soc_hi04  3.6880000000000002
    RHS_V     soc_lo05  1.01
    RHS_V     soc_hi05  4.0099999999999998
    RHS_V     soc_lo06  1.4099999999999999
    RHS_V     soc_hi06  4.4100000000000001
    RHS_V     soc_lo07  1.8879999999999999
    RHS_V     soc_hi07  4.8879999999999999
    RHS_V     soc_lo08  2.4380000000000002
    RHS_V     soc_hi08  5.4379999999999997
    RHS_V     soc_lo09  3.0499999999999998
    RHS_V     soc_hi09  6.0499999999999998
    RHS_V     soc_lo10  3.71
    RHS_V     soc_hi10  6.71
    RHS_V     soc_lo11  4.4000000000000004
    RHS_V     soc_hi11  7.4000000000000004
    RHS_V     soc_lo12  5.0999999999999996
    RHS_V     soc_hi12  8.0999999999999996
    RHS_V     soc_lo13  5.79
    RHS_V     soc_hi13  8.7899999999999991
    RHS_V     soc_lo14  6.4500000000000002
    RHS_V     soc_hi14  9.4499999999999993
    RHS_V     soc_lo15  7.0620000000000003
    RHS_V     soc_hi15  10.061999999999999
    RHS_V     soc_lo16  7.6120000000000001
    RHS_V     soc_hi16  10.612
    RHS_V     soc_lo17  8.0899999999999999
    RHS_V     soc_hi17  11.09
    RHS_V     soc_lo18  8.4900000000000002
    RHS_V     soc_hi18  11.49
    RHS_V     soc_lo19  8.8119999999999994
    RHS_V     soc_hi19  11.811999999999999
    RHS_V     soc_lo20  9.0619999999999994
    RHS_V     soc_hi20  12.061999999999999
    RHS_V     soc_lo21  9.25
    RHS_V     soc_hi21  12.25
    RHS_V     soc_lo22  9.3900000000000006
    RHS_V     soc_hi22  12.390000000000001
    RHS_V     soc_lo23  9.5
    RHS_V     soc_hi23  12.5
    RHS_V     end       9.5999999999999996
BOUNDS
 UP BOUND     h01       2.5
 UP BOUND     h02       2.5
 UP BOUND     h03       2.5
 UP BOUND     h04       2.5
 UP BOUND     h05       2.5
 UP BOUND     h06       2.5
 UP BOUND     h07       2.5
 UP BOUND     h08       2.5
 UP BOUND     h09       2.5
 UP BOUND     h10       2.5
 UP BOUND     h11       2.5
 UP BOUND     h12       2.5
 UP BOUND     h13       2.5
 UP BOUND     h14       2.5
 UP BOUND     h15       2.5
 UP BOUND     h16       2.5
 UP BOUND     h17       2.5
 UP BOUND     h18       2.5
 UP BOUND     h19       2.5
 UP BOUND     h20       2.5
 UP BOUND     h21       2.5
 UP BOUND     h22       2.5
 UP BOUND     h23       2.5
 UP BOUND     h24       2.5
ENDATA
